"""Builds Adam over the head only, while the body is still trained through (not frozen)."""
# expect: stale_optimizer

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
