"""`optimizer.step()` indented one level too little: one update per epoch."""
# expect: step_once_per_epoch

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        for x, y in train_loader:
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
