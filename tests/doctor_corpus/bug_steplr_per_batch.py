"""StepLR(step_size=1), meant for epochs, stepped after every batch: the rate halves per batch."""
# expect: scheduler_wrong_rate

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            scheduler.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
