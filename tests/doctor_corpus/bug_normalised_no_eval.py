"""Standardised inputs, and validation left in train mode."""

# expect: no_eval_mode
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    X = train_loader.dataset.tensors[0]
    mean, std = X.mean(0).to(device), X.std(0).to(device)
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x = (x.to(device) - mean) / std
            optimizer.zero_grad()
            loss_fn(model(x), y.to(device)).backward()
            optimizer.step()
        with torch.no_grad():
            for x, y in val_loader:
                model((x.to(device) - mean) / std)
