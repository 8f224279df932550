"""Re-initialises the classifier by building a new head at the second epoch."""

# expect: stale_optimizer
import torch
from torch import nn


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for epoch in range(epochs):
        if epoch == 1:
            model.head = nn.Linear(model.head.in_features, 3).to(device)
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
