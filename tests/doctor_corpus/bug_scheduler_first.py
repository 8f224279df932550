"""Steps the per-batch scheduler at the top of each batch, before the optimizer."""
# expect: scheduler_before_optimizer

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.05 * step))
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            sched.step()
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
