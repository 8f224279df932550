"""Gathers the whole training set into two tensors on the device, then draws its own shuffled
mini-batches by index, as one does when the data fits in memory; validation in one forward."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    X = torch.cat([x for x, _ in train_loader]).to(device)
    Y = torch.cat([y for _, y in train_loader]).to(device)
    Xv, Yv = (torch.cat(t).to(device) for t in zip(*val_loader))
    model.to(device)
    bs = 8
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(X), device=device)
        for i in range(0, len(X), bs):
            idx = perm[i : i + bs]
            optimizer.zero_grad()
            loss_fn(model(X[idx]), Y[idx]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_acc = (model(Xv).argmax(1) == Yv).float().mean().item()
    return val_acc
