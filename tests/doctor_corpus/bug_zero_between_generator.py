"""Generator-fed loop that clears the gradients between backward and step."""
# expect: no_learning

import torch


def batches(loader, device):
    for x, y in loader:
        yield x.to(device), y.to(device)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in batches(train_loader, device):
            loss_fn(model(x), y).backward()
            optimizer.zero_grad()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in batches(val_loader, device):
                model(x)
