"""Returns a history dict whose training losses are tensors with their graphs."""
# expect: graph_kept_alive

from collections import defaultdict

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    history = defaultdict(list)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            history["train_loss"].append(loss)
        model.eval()
        with torch.no_grad():
            history["val_loss"] += [
                loss_fn(model(x.to(device)), y.to(device)) for x, y in val_loader
            ]
    return dict(history)
