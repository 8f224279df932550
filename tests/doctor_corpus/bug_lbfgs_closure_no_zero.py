"""LBFGS whose closure never clears the gradients."""
# expect: missing_zero_grad

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)

            def closure():
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
