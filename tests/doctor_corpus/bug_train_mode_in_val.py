"""A copy-pasted block calls model.train() right before validating."""

# expect: no_eval_mode
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.train()
        with torch.no_grad():
            for x, y in val_loader:
                loss_fn(model(x.to(device)), y.to(device)).item()
