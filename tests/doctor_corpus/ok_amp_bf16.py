"""Mixed precision with bfloat16 autocast on whatever device was asked for (CPU included)."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    device = torch.device(device)
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = model(x)
                loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            for x, y in val_loader:
                loss_fn(model(x.to(device)), y.to(device))
