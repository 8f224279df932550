"""Feeds float one-hot-like targets of the wrong shape: the loss raises on the first batch."""
# expect: fit_raised


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.float().unsqueeze(1).to(device)).backward()
            optimizer.step()
