"""Validates every third training batch on one validation batch, drawn from a cycling iterator."""
# expect: none

import itertools

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    val_batches = itertools.cycle(val_loader)
    log = []
    for _ in range(epochs):
        model.train()
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            if step % 3 == 0:
                vx, vy = next(val_batches)
                model.eval()
                with torch.inference_mode():
                    vloss = loss_fn(model(vx.to(device)), vy.to(device))
                model.train()
                log.append((loss.item(), vloss.item()))
    return log
