"""Own DataLoader of 16 examples per batch, in a while loop, and the step after the batch loop."""

# expect: step_once_per_epoch
import torch
from torch.utils.data import DataLoader


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    loader = DataLoader(train_loader.dataset, batch_size=16, shuffle=True)
    model.to(device)
    epoch = 0
    while epoch < epochs:
        model.train()
        optimizer.zero_grad()
        for x, y in loader:
            loss_fn(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
        epoch += 1
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
