"""A closure factory builds the train step; Adam replaces the given optimizer, built once."""
# expect: none

import torch


def make_train_step(model, loss_fn, optimizer):
    def train_step(x, y):
        model.train()
        yhat = model(x)
        loss = loss_fn(yhat, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    return train_step


def make_val_step(model, loss_fn):
    @torch.no_grad()
    def val_step(x, y):
        model.eval()
        return loss_fn(model(x), y).item()

    return val_step


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_step = make_train_step(model, loss_fn, optimizer)
    val_step = make_val_step(model, loss_fn)
    losses, val_losses = [], []
    for _ in range(epochs):
        losses += [train_step(x.to(device), y.to(device)) for x, y in train_loader]
        val_losses += [val_step(x.to(device), y.to(device)) for x, y in val_loader]
    return losses, val_losses
