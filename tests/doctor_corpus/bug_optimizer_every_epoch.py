"""Builds a fresh Adam at the start of every epoch, throwing its moment estimates away."""
# expect: optimizer_rebuilt

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
