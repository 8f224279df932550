"""CosineAnnealingWarmRestarts stepped per batch with a fractional epoch, as its docs show."""

# expect: none
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=1)
    iters = len(train_loader)
    for epoch in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            sched.step(epoch + i / iters)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
