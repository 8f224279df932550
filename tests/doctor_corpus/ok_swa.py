"""Stochastic weight averaging (torch.optim.swa_utils) of the last epoch; validates the average."""

# expect: none
import torch
from torch.optim.swa_utils import AveragedModel


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    swa_model = AveragedModel(model)
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        if epoch == epochs - 1:
            swa_model.update_parameters(model)
        swa_model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                swa_model(x.to(device))
    return swa_model
