"""Momentum SGD rebuilt inside the batch loop, in a while loop."""

# expect: optimizer_rebuilt
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    e = 0
    while e < epochs:
        model.train()
        for x, y in train_loader:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
        e += 1
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
