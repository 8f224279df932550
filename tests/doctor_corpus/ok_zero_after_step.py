"""Gradients are cleared after each step (and once before the first), not before the forward."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    optimizer.zero_grad()
    for epoch in range(1, epochs + 1):
        model.train()
        running = 0.0
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss = loss_fn(output, target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            running += loss.item()
        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for data, target in val_loader:
                data, target = data.to(device), target.to(device)
                test_loss += loss_fn(model(data), target).item()
        print(f"epoch {epoch} train {running / (batch_idx + 1):.3f} val {test_loss:.3f}")
