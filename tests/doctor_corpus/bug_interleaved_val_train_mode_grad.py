"""Interleaved validation with neither `model.eval()` nor `torch.no_grad()`."""
# expect: no_eval_mode, grad_enabled_in_eval


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    vals = []
    for _ in range(epochs):
        val_iter = iter(val_loader)
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            if step % 2 == 1:
                vx, vy = next(val_iter)
                vals.append(loss_fn(model(vx.to(device)), vy.to(device)).item())
    return vals
