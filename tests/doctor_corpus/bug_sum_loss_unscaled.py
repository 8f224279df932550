"""Accumulates by summing four micro-batch losses and one backward, never dividing."""

# expect: accumulation_unscaled
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        batches = list(train_loader)
        for k in range(0, len(batches), 4):
            optimizer.zero_grad()
            loss = sum(loss_fn(model(x.to(device)), y.to(device)) for x, y in batches[k : k + 4])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
