"""Steps before backward, then clears at the top of the next batch: nothing is ever applied."""
# expect: no_learning

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            optimizer.step()
            loss.backward()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
