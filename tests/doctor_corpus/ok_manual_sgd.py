"""No optimizer at all: a hand-written SGD update under `torch.no_grad()`, as tutorials do it."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    lr = 0.1
    model.to(device)
    for _ in range(epochs):
        model.train()
        for xb, yb in train_loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
                    p.grad.zero_()
        model.eval()
        with torch.no_grad():
            valid = [loss_fn(model(xb.to(device)), yb.to(device)) for xb, yb in val_loader]
        print(torch.stack(valid).mean())
