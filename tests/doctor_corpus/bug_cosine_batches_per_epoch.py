"""CosineAnnealingLR sized in updates (`epochs * len(loader)`), stepped once per epoch."""
# expect: scheduler_wrong_rate

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(train_loader))
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
        sched.step()
