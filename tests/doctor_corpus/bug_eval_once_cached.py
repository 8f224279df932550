"""Own DataLoader, model put in train mode once before the loop, eval mode after validating."""
# expect: train_mode_not_restored

import torch
from torch.utils.data import DataLoader


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    dl = DataLoader(train_loader.dataset, batch_size=8, shuffle=True)
    model.to(device).train()
    for _ in range(epochs):
        for x, y in dl:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
