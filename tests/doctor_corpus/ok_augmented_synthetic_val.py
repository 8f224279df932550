"""Adds Gaussian noise to training inputs (augmentation) and validates on clean batches."""

# expect: none
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    g = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x = x + 0.05 * torch.randn(x.shape, generator=g)
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
