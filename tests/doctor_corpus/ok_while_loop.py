"""A step-driven `while` loop over a restarting iterator, as iteration-based trainers do."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model = model.to(device)
    max_steps = epochs * len(train_loader)
    step = 0
    it = iter(train_loader)
    while step < max_steps:
        try:
            inputs, targets = next(it)
        except StopIteration:
            it = iter(train_loader)
            inputs, targets = next(it)
        model.train()
        optimizer.zero_grad()
        loss = loss_fn(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        step += 1
        if step % len(train_loader) == 0:
            model.eval()
            with torch.no_grad():
                for inputs, targets in val_loader:
                    loss_fn(model(inputs.to(device)), targets.to(device))
    return step
