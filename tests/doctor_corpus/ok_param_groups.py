"""AdamW with two parameter groups (a smaller rate for the body), `model.zero_grad()`, and a
LinearLR warm-up of five updates followed by nothing."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.AdamW(
        [
            {"params": model.body.parameters(), "lr": 1e-3},
            {"params": model.head.parameters(), "lr": 1e-2},
        ],
        weight_decay=0.05,
    )
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=5)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            model.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
            warmup.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
