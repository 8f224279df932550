"""Hand-written SGD with momentum buffers kept in a dict, gradients dropped with `p.grad = None`."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model = model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    velocity = {p: torch.zeros_like(p) for p in params}
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            loss_fn(model(x.to(device)), y.to(device)).backward()
            with torch.no_grad():
                for p in params:
                    velocity[p].mul_(0.9).add_(p.grad)
                    p.add_(velocity[p], alpha=-0.05)
                    p.grad = None
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
    return model
