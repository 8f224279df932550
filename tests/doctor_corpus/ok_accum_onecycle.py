"""Accumulation of 2 with OneCycle sized in optimizer steps, set_to_none after step."""

# expect: none
import math

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    accum = 2
    model.to(device)
    updates_per_epoch = math.ceil(len(train_loader) / accum)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=1e-2, total_steps=epochs * updates_per_epoch
    )
    for _ in range(epochs):
        model.train()
        for step, (x, y) in enumerate(train_loader):
            loss = loss_fn(model(x.to(device)), y.to(device)) / accum
            loss.backward()
            if (step + 1) % accum == 0 or step + 1 == len(train_loader):
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
