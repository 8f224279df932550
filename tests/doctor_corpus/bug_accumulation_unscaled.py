"""Accumulates three batches per update (tail included) but never divides the loss."""
# expect: accumulation_unscaled

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    every = 3
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        for i, (x, y) in enumerate(train_loader):
            loss_fn(model(x.to(device)), y.to(device)).backward()
            if (i + 1) % every == 0 or i + 1 == len(train_loader):
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
