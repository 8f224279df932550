"""A helper steps the optimizer, and the loop steps it again: each gradient is applied twice."""
# expect: missing_zero_grad

import torch


def backward_and_step(loss, optimizer):
    loss.backward()
    optimizer.step()


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            backward_and_step(loss_fn(model(x.to(device)), y.to(device)), optimizer)
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
