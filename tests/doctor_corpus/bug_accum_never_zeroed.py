"""Accumulation of 2 batches, scaled, stepping on the tail, but never zeroing."""

# expect: missing_zero_grad
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            (loss_fn(model(x.to(device)), y.to(device)) / 2).backward()
            if i % 2 == 1 or i == len(train_loader) - 1:
                optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
