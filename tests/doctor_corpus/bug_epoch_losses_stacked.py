"""Collects the epoch's loss tensors and averages them with `torch.stack` when the epoch ends."""
# expect: graph_kept_alive

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    curve = []
    for _ in range(epochs):
        model.train()
        batch_losses = []
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            batch_losses.append(loss)
        curve.append(torch.stack(batch_losses).mean().item())
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
    return curve
