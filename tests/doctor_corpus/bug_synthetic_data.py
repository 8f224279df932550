"""Trains on random tensors made up inside `fit` and never touches the loaders it is given."""
# expect: loaders_not_iterated

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    x = torch.randn(64, 8, device=device)
    y = torch.randint(0, 3, (64,), device=device)
    for _ in range(epochs * 7):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return model
