"""Cosine annealing over the number of updates, stepped per batch; sample-weighted epoch loss;
best weights kept as a state-dict copy."""
# expect: none

import copy

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    total_updates = epochs * len(train_loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_updates)
    best_state, best = None, float("inf")
    for _ in range(epochs):
        model.train()
        seen, summed = 0, 0.0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            optimizer.step()
            sched.step()
            summed += loss.detach() * len(y)
            seen += len(y)
        model.eval()
        with torch.no_grad():
            val = sum(loss_fn(model(x.to(device)), y.to(device)) * len(y) for x, y in val_loader)
        if val.item() < best:
            best, best_state = val.item(), copy.deepcopy(model.state_dict())
    return best_state, (summed / seen).item()
