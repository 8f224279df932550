"""Validation detaches the outputs instead of turning autograd off."""

# expect: grad_enabled_in_eval
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        preds = [model(x.to(device)).detach().argmax(1) for x, _ in val_loader]
        model.train()
    return torch.cat(preds)
