"""Turns the parameters' `requires_grad` off for validation instead of `no_grad` (GAN-code habit):
no graph is recorded, so nothing is wasted."""
# expect: none


def set_requires_grad(model, flag):
    for p in model.parameters():
        p.requires_grad_(flag)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        set_requires_grad(model, True)
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        set_requires_grad(model, False)
        scores = [loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader]
    set_requires_grad(model, True)
    return scores
