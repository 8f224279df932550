"""LBFGS: `optimizer.step(closure)` re-evaluates the loss as many times as it needs."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)

            def closure():
                lbfgs.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss

            lbfgs.step(closure)
        model.eval()
        with torch.no_grad():
            total = sum(loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader)
    return total
