"""Builds its optimizer from the first two parameter tensors only (a slicing slip)."""

# expect: stale_optimizer
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.SGD(list(model.parameters())[:2], lr=0.1, momentum=0.9)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
