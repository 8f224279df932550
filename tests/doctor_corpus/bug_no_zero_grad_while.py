"""An iteration-based `while` loop that never clears the gradients."""
# expect: missing_zero_grad

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    step, total = 0, epochs * len(train_loader)
    batches = iter(train_loader)
    while step < total:
        batch = next(batches, None)
        if batch is None:
            batches = iter(train_loader)
            continue
        x, y = (t.to(device) for t in batch)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
    model.eval()
    with torch.no_grad():
        return [model(x.to(device)).argmax(1) for x, _ in val_loader]
