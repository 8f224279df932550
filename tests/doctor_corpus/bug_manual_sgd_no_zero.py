"""Hand-written SGD that forgets to clear `.grad` after the update."""
# expect: missing_zero_grad

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            loss_fn(model(x.to(device)), y.to(device)).backward()
            with torch.no_grad():
                for w in model.parameters():
                    w.sub_(0.1 * w.grad)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
