"""Ignores the loaders it is given and builds its own from their datasets (bigger batches)."""
# expect: none

import torch
from torch.utils.data import DataLoader


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    train_dl = DataLoader(train_loader.dataset, batch_size=16, shuffle=True, drop_last=False)
    valid_dl = DataLoader(val_loader.dataset, batch_size=32)
    model = model.to(device)
    for epoch in range(epochs):
        model.train()
        for xb, yb in train_dl:
            xb, yb = xb.to(device), yb.to(device)
            pred = model(xb)
            loss = loss_fn(pred, yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            valid_loss = sum(loss_fn(model(xb.to(device)), yb.to(device)) for xb, yb in valid_dl)
        print(epoch, (valid_loss / len(valid_dl)).item())
