"""`model.eval()` placed after the validation loop instead of before it."""
# expect: no_eval_mode

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader)
        model.eval()
    return val_loss
