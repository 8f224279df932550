"""A train-step helper that builds its SGD-with-momentum optimizer on every call."""
# expect: optimizer_rebuilt

import torch


def train_step(model, x, y, loss_fn):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            train_step(model, x.to(device), y.to(device), loss_fn)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
