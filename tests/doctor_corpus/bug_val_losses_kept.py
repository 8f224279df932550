"""Validation with autograd on, its loss tensors kept in a list across epochs."""
# expect: grad_enabled_in_eval, graph_kept_alive


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    val_losses = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        for x, y in val_loader:
            val_losses.append(loss_fn(model(x.to(device)), y.to(device)))
    return val_losses
