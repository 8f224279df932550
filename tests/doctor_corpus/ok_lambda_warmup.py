"""Linear warm-up then linear decay as a LambdaLR, stepped per batch; validation every 5 steps."""

# expect: none
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    total = epochs * len(train_loader)
    warm = 3
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / (total - warm))
    )
    step = 0
    for _ in range(epochs):
        for x, y in train_loader:
            model.train()
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            sched.step()
            step += 1
            if step % 5 == 0:
                model.eval()
                with torch.no_grad():
                    v = [loss_fn(model(a.to(device)), b.to(device)).item() for a, b in val_loader]
    return v
