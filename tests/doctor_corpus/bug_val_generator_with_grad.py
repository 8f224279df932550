"""Validation through a generator of predictions, with autograd left on."""
# expect: grad_enabled_in_eval


def predictions(model, loader, device):
    model.eval()
    for x, y in loader:
        yield model(x.to(device)).argmax(dim=1), y.to(device)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    accs = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        hits = sum((p == y).sum().item() for p, y in predictions(model, val_loader, device))
        accs.append(hits / len(val_loader.dataset))
    return accs
