"""A stub that was never filled in: returns the model untouched."""
# expect: loaders_not_iterated


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    return model.to(device)
