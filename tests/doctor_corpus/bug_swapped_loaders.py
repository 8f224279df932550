"""The loaders swapped by a helper's argument order: trains on validation, validates on train."""
# expect: trains_on_validation

import torch


def run(model, optimizer, loss_fn, val_loader, train_loader, device, epochs):
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


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    run(model, optimizer, loss_fn, train_loader, val_loader, device, epochs)
