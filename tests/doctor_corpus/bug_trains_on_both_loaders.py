"""Trains on `itertools.chain(train_loader, val_loader)`: the validation set is learned."""
# expect: trains_on_validation

import itertools

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in itertools.chain(train_loader, val_loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = sum((model(x.to(device)).argmax(1) == y.to(device)).sum() for x, y in val_loader)
    return acc
