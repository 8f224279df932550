"""Detaches the logits "to save memory" and silences the resulting error with `requires_grad_`."""
# expect: no_learning

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            logits = model(x.to(device)).detach().requires_grad_()
            loss_fn(logits, y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
