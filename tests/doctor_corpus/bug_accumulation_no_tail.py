"""Accumulates four batches per update, scaled, but never steps the epoch's last partial group."""
# expect: accumulation_tail_leak

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    accum = 4
    model.to(device)
    optimizer.zero_grad()
    for _ in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            (loss_fn(model(x.to(device)), y.to(device)) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
