"""Caches both loaders into one list on the device and trains on all of it."""
# expect: trains_on_validation

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    data = [(x.to(device), y.to(device)) for x, y in [*train_loader, *val_loader]]
    n_train = len(train_loader)
    for _ in range(epochs):
        model.train()
        for x, y in data:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in data[n_train:]:
                model(x)
