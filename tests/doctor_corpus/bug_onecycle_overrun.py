"""OneCycleLR sized in epochs but stepped per batch: torch raises once it runs past its end."""
# expect: fit_raised, scheduler_wrong_rate

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.3, total_steps=epochs)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
