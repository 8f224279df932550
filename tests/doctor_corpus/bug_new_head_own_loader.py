"""Transfer-learning style: replaces the classifier head after the optimizer was built."""
# expect: stale_optimizer

import torch
from torch import nn
from torch.utils.data import DataLoader


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.head = nn.Linear(model.head.in_features, model.head.out_features)
    model.to(device)
    loader = DataLoader(train_loader.dataset, batch_size=8, shuffle=True)
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
