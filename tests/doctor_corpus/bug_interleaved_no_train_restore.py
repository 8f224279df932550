"""Checks one validation batch every few steps with `model.eval()`, and never switches back."""
# expect: train_mode_not_restored

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    model.train()
    val_iter = iter(val_loader)
    for _ in range(epochs):
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            if step % 4 == 3:
                vx, vy = next(val_iter, (None, None))
                if vx is None:
                    val_iter = iter(val_loader)
                    vx, vy = next(val_iter)
                model.eval()
                with torch.no_grad():
                    loss_fn(model(vx.to(device)), vy.to(device))
