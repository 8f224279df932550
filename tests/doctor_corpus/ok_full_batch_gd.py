"""Full-batch gradient descent: the whole training set in one forward, one step per epoch."""

# expect: none
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    X, y = (t.to(device) for t in train_loader.dataset.tensors)
    Xv, yv = (t.to(device) for t in val_loader.dataset.tensors)
    model.to(device)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss_fn(model(X), y).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            val = loss_fn(model(Xv), yv).item()
    return val
